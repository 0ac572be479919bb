# `make jupyter` runs JupyterLab with this file. It serves the repository, so the notebooks'
# links to docs/ open, and starts in notebooks/; a save of a tracked notebook
# (notebooks/NN_*.ipynb) writes it without outputs, so working in the lab never puts outputs
# into git's files; it starts as root too (containers run so). The lab's JupyterLab settings
# (.jupyter/lab/settings/overrides.json: defaults a user's own settings still override) turn
# off the news pop-up and the update check (there may be no network) and open markdown files
# rendered. Its kernels do not show the known third-party deprecation warnings
# (labkit.lab.KNOWN_WARNINGS).
import os
from pathlib import Path

from labkit.lab import lab_contents_manager, quiet_kernels

HERE = Path(__file__).resolve().parent
c = get_config()  # noqa: F821 - Jupyter's config object
c.ServerApp.root_dir = str(HERE.parent)
c.LabApp.default_url = "/lab/tree/notebooks"
c.ServerApp.allow_root = hasattr(os, "geteuid") and os.geteuid() == 0
c.ServerApp.contents_manager_class = lab_contents_manager()  # saves through labkit.lab.pre_save_hook
c.LabApp.app_settings_dir = str(HERE / "lab" / "settings")
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
quiet_kernels()
