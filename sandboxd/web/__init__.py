"""The web plumbing both fronts share (the native API, :mod:`sandboxd.http`, and the E2B
front, :mod:`sandboxd.e2b`): the twisted.web site and its channel's defences, the request and
its body spool, the connection gate, and the producers that write long answers (a followed
stream, a paced answer, a bounded file). Nothing here knows a front's routes or vocabulary:
each front passes its own rule and refusal (:mod:`sandboxd.web.guard`)."""
