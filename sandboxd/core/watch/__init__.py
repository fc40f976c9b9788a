"""A live view of a sandbox's workspace: inotify, run with the sandbox's credentials."""
