"""What the tests share: the one daemon launcher (``daemon.py``) and the fakes
(``fakes.py``, ``kernel_fakes.py``)."""
