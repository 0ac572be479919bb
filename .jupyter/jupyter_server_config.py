# `make jupyter` runs JupyterLab with this file: a save of a tracked notebook (notebooks/NN_*.ipynb)
# writes it without outputs, so working in the lab never puts outputs into git's files.
from labkit.lab import pre_save_hook

c.FileContentsManager.pre_save_hook = pre_save_hook  # noqa: F821 - `c` is Jupyter's config object
