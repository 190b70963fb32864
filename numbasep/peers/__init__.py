"""Peers timed next to numbasep, each in its own process (see :mod:`numbasep.peers.driver`).

The runner scripts in this folder (``tf_runner.py``, ``torch_runner.py``,
``jax_runner.py``) are run by path with the interpreter given to
``numbasep bench --peers-python`` and import nothing from numbasep, so the peers
can live in a separate virtual environment.
"""
