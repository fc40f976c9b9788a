"""Templates: named, read-only root filesystems a sandbox can run in (docs/extensions.rst,
"Templates"): the store (:mod:`.store`), what an archive holds (:mod:`.sources`) and how its
members are written without leaving the template's directory (:mod:`.extract`)."""
