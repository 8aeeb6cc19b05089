"""Example training scripts shipped with fthsdp: the payload of ``fthsdp demo``.

Nothing in fthsdp imports this package; each example is run as a module by
``fthsdp agent``, e.g. ``-- python -m fthsdp.examples.gpt.train --steps 300``.
"""
