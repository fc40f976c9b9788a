"""The privilege-drop chain: the exec helper ``sandboxd-exec`` (``sandboxd_exec.c`` and its
headers, seccomp filter included; ``helper.py``, ``helper_build.py``), its shell fallback
(``wrapper.py``), the steps both take (``privdrop.py``) and the spawn server."""
