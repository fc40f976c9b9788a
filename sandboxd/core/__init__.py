"""The core: sandboxes, their commands, files, archive and tools, as plain values and events.

Nothing here sees a request, a status code or a wire frame; the fronts (:mod:`sandboxd.http`)
parse, call the core, and encode.
"""
