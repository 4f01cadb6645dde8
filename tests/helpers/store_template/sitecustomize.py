"""Subprocesses of the test suite fill new SQLite MLflow stores from a migrated template.

See ``mlflow_store_template.py`` beside this file; ``tests/conftest.py`` puts this folder on
``PYTHONPATH``.
"""

import mlflow_store_template

mlflow_store_template.install()
