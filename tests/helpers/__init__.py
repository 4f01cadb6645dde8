"""What several test files share, importable from every test as ``helpers``.

pyproject.toml puts ``tests/`` on ``sys.path`` (pytest's ``pythonpath`` setting), so a test
writes ``from helpers.server import Server``; test files never import one another.

- :mod:`helpers.paths`: the repository's folders and the console scripts of this environment.
- :mod:`helpers.console`: ``lightning-losses ...`` in a subprocess, with a clean environment.
- :mod:`helpers.server`: a real ``mlflow server`` on 127.0.0.1 and free ports.
- :mod:`helpers.ddp`: two-process runs: gloo process groups (``torch.multiprocessing``) and
  Lightning's own DDP launch of the console script.
"""
