"""Workspace files: path normalisation and the file operations, run as the sandbox."""
