"""The archive: restoring a sandbox from its item and persisting it back, through rsync."""
