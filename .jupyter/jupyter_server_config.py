# `make jupyter` runs JupyterLab with this file. It serves the repository, so the notebooks'
# links to docs/ open, and starts in notebooks/; a save of a tracked notebook
# (notebooks/NN_*.ipynb) writes it without outputs, so working in the lab never puts outputs
# into git's files; it starts as root too (containers run so), without the news pop-up and
# the update check (JupyterLab asks the network for both); its kernels do not show the known
# third-party deprecation warnings (labkit.lab.KNOWN_WARNINGS).
import os
from pathlib import Path

from labkit.lab import pre_save_hook, quiet_kernels

c = get_config()  # noqa: F821 - Jupyter's config object
c.ServerApp.root_dir = str(Path(__file__).resolve().parents[1])
c.LabApp.default_url = "/lab/tree/notebooks"
c.ServerApp.allow_root = hasattr(os, "geteuid") and os.geteuid() == 0
c.FileContentsManager.pre_save_hook = pre_save_hook
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
quiet_kernels()
