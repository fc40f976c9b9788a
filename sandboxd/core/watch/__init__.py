"""The workspace watch (SPEC §2.2): inotify, read by the reactor."""
