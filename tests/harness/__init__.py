"""What more than one test module uses; a test module imports from here, never
from another ``tests/test_*.py``. Worker scripts that tests run as processes
(``python -m tests.ftar_worker`` and the other ``tests/*_worker.py``,
tests/rank_script.py, tests/netns_gloo.py) stay in tests/, where their module
names are written in tests, benchmarks and docs; so does tests/slurm_cluster.py,
test_slurm's alone and linked from deploy/slurm/README.md.

Processes and waiting:

- ``processes``: real OS processes from the repository: ``CoordinatorProcess``,
  ``WorkerProcess``, ``AgentProcess``, ``ReplicaProcess``; ``ROOT`` and
  ``_env()``, the environment every child of a test gets.
- ``waiting``: ``wait_until``, a condition with a deadline (never a sleep).
- ``ending``: ``end_started``: once a test is over (tests/conftest.py calls it
  as the teardown begins, and a test's own cleanup may), every process it
  started is SIGKILLed at once with its descendants, not stopped gracefully
  one by one; those of module- and session-scoped fixtures are kept.
- ``events``: ``JsonLog``, a ``--log-format json`` log of a coordinator or
  agent: ``wait_event``/``events_named`` find an event by name and fields.
- ``cli``: ``fthsdp(*args)``, the command run as a user runs it, and
  ``one_line_error``, what a user's mistake must print.
- ``cluster``: ``Cluster``, the builder of every ``cluster`` fixture
  (coordinators and replicas stopped at the end), and ``stop_together``.
- ``fixtures``: the fixtures of the whole suite, registered by
  tests/conftest.py's ``pytest_plugins``: the catch-up ``cluster``,
  ``token_file``, ``processes``; ``FOREVER``, ``HIDDEN``, ``TOKEN``.
- ``supervised``: coordinators under a supervisor that restarts them,
  etcd stalls.

Training and its checks:

- ``replicas``: what the coordinator says of replicas (``status_of``,
  ``members``), catch-up transfers, and the checks that states agree step
  by step; the hang settings of the process tests.
- ``ddp``: the DDP oracle (``start_ddp_oracle``, for tests/ddp_worker.py and
  tests/nanogpt_ddp_worker.py alike) and ``train_with_ddp_and_fthsdp``.
- ``fake_collectives``: an in-process transport for FTAR whose collectives complete
  when a test says (tests/test_commit_vote.py, tests/test_ftar_phases.py).
- ``ftar_members``: members running FTAR on threads over it, killed before a given
  collective, with the phases each ran (tests/test_ftar_phases.py).
- ``hsdp``: ``hsdp_agent``, a replica of FSDP2 shard ranks, and its shape.
- ``buckets``: ``RecordingPg``, a process group that only records, and the
  small bucketed ``model``.

The coordinator without processes:

- ``runtimes``: ``CoordinatorRuntime`` on a fake clock: joined, hung, straggling.
- ``jobs``: one ``JobState`` driven by hand: ``registered``, ``formed``,
  ``joined_job`` under ``HANG_RULES``.
- ``inprocess``: ``InProcessCoordinator``, a real server on a thread; the
  auth tests' tokens.
- ``quorum_cases``: the quorum decision tables' cases and checks.
- ``etcd``: fresh key prefixes, the stored committed step, the leader log line.
- ``web``: the HTTP API and the page as headless Chromium renders it.

Whole set-ups:

- ``netns``, ``netns_state``: network namespaces for network-fault tests
  (``python -m tests.harness.netns leftovers`` removes a dead run's).
- ``netjob``: ``Job``, a coordinator and replicas under ``fthsdp agent`` in
  those namespaces; ``jobs_in_lab``, the ``job_in_lab`` fixtures' body; the
  checks ``assert_one_state_per_step`` and ``assert_no_step_lost``.
- ``soak``, ``soak_control``: the randomized fault soak and its control-plane faults.
- ``tls_certs``: throwaway certificates.
- ``deploy_files``: reading deploy/ (units, scripts, manifests) for the deployment and docs tests.
- ``kubernetes``: the manifests as the API server and the JobSet controller read them (the
  schema check, the JobSet's Jobs, failure and success policies), for the deployment tests.
"""
