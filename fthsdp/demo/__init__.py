"""``fthsdp demo``: a coordinator, replicas of the example model under real
agents, a failure, its recovery, a live view, a summary and a PNG report.

Modules: ``config`` (the flags), ``scenario`` (what happens, in order),
``children`` (the processes and their clean-up), ``record`` (what was seen),
``poller`` (the coordinator's status over time), ``live`` (the views),
``summary`` (the figures), ``report`` (the PNG).
"""
