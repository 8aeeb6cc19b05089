"""A small character-level GPT trained under fthsdp (``python -m fthsdp.examples.gpt.train``).

``train.py`` is the script (run it as a module, under ``fthsdp agent``),
``model.py`` the model and ``data.py`` its corpus and batches.
"""
