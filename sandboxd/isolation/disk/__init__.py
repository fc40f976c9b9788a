"""Per-sandbox disk limits (``SANDBOXD_DISK_MAX``, ``SANDBOXD_FILES_MAX``), kernel-enforced.

One driver per mechanism, chosen from the state root's filesystem at start-up
(:func:`sandboxd.isolation.disk.select.build_disk`): btrfs subvolumes with simple-quota
qgroups (:mod:`.btrfs`), ext4/XFS project quotas (:mod:`.project`), or no limits
(:mod:`.plain`). The driver makes each sandbox's top directory ``{root}/{rid}``, so everything
the sandbox can write there (workspace, home, tmp) is charged to the sandbox.
"""
