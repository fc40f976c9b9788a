"""The routes of the native front, one module per concern, each registered on the one Klein
app of :mod:`sandboxd.http.routing` when it is imported (by :mod:`sandboxd.http.api`)."""
