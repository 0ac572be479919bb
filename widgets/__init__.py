"""ipywidgets views over labkit run folders and records."""
