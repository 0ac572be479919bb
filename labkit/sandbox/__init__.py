"""Floor 0, the sandbox: untrusted candidate programs run against their tests, graded
outside them.

Design (the threat model, and which test checks each answer, are in ``docs/sandbox.md``):

* **Grade in the parent.** For an :class:`~labkit.sandbox.records.IOCase` the sandboxed child
  only calls ``entry_point(*args)`` and sends the output back as tagged JSON
  (:mod:`labkit.sandbox.plain`, exact builtin types only). The expected value never leaves this
  process; it is compared here with :func:`~labkit.sandbox.plain.strict_equal` (or the case's
  ``approx`` / ``truthy`` / ``falsy`` mode). Always-equal objects, ``int``/``str`` subclasses,
  patched builtins and forged result lines therefore earn nothing. Outputs are decoded with
  :func:`~labkit.sandbox.plain.decode_untrusted`: it never raises and costs time linear in the
  reply (a malformed reply voids that one check), and a grading failure is confined to its
  check.
* **No verdict in the candidate's process.** An :class:`~labkit.sandbox.records.AssertTest` runs
  in the worker's *grader*, a trusted process forked before the child that never runs
  candidate code: ``candidate`` is a proxy whose calls go to the child and come back as
  plain data. Its verdicts travel on a pipe no process of the check holds
  (``graded_in="grader"``), and the child never holds the tests' source.
* **Warm fork-server pool.** ``workers`` processes (``worker.py``, standard library only)
  are started once; each check is a ``fork`` of a warm worker (a ``clone`` into new PID,
  mount and IPC namespaces), so there is no interpreter start and no re-import per check.
* **Confinement per check**: new session, rlimits (CPU, address space, processes, file size,
  open files, no core), a cgroup capping the memory and the processes of all the check's
  processes together (:mod:`labkit.sandbox.cgroups`), a dedicated non-root uid per worker,
  ``no_new_privs``, a seccomp system-call filter (:mod:`labkit.sandbox.syscall_filter`), the
  uid's keyrings emptied, stdin and stdout on ``/dev/null``, stderr and results on capped
  pipes, a private working directory, a fresh IPC namespace and a fresh PID namespace (the
  check is pid 1 and has a ``/proc`` of its own), a wall deadline enforced by the worker,
  then the process group killed and everything the uid left swept.
* **Fail-fast tells nothing.** With :attr:`SandboxConfig.fail_fast` a check is graded up to
  its first failure, but never ended at a wrong answer: it runs to its end line or its time
  limits, so a candidate cannot learn which answer was wrong. Where the process is root on Linux each
  worker also lives in an empty network namespace and a private mount namespace whose root
  is an **allow-list**: the standard library, the interpreter and its shared libraries, a
  few device nodes, ``/proc`` and a private ``/tmp``, all read-only but ``/tmp`` and
  ``/dev/shm``. No other file of the host (this checkout, virtualenvs, ``/opt``, ``/home``,
  ...) exists there. Elsewhere it degrades and :attr:`Sandbox.protections` says what is off.
* **Bounded parsing.** Code over :attr:`SandboxConfig.max_code_bytes` is graded as an error
  without being parsed or sent to a worker: parsing costs about 360 bytes of memory per byte.

The package is the security boundary of the house, on its lowest floor: it imports nothing
of labkit above it and no torch. The parent side runs in the caller's process: the worker pool
(:mod:`.pool`), its settings (:mod:`.config`), grading in the parent (:mod:`.grading`), the
syntax-tree hack scan (:mod:`.hackscan`), the system-call filter (:mod:`.syscall_filter`) and
the records that go in and come out (:mod:`.records`). The worker side is standard library
only and runs as ``python -s -P labkit/sandbox/worker.py``, which loads this folder by path as
the package ``_labkit_sandbox``, never through ``labkit``: the worker loop (:mod:`.worker`), the
isolation it sets up once (:mod:`.isolation`, :mod:`.view`, :mod:`.cgroups`), the Linux calls
it makes (:mod:`.syscalls`), its byte channels (:mod:`.wire`), the sandboxed child
(:mod:`.child`) and the trusted grader (:mod:`.grader`); :mod:`.plain`, the codec of plain
values, serves both sides. Worker-side modules import each other relatively.

Typical use::

    with Sandbox(SandboxConfig(timeout_s=3)) as sandbox:
        results = sandbox.run_many(candidates, progress=True)

or :func:`run_many` over a process-wide :func:`default_sandbox`.
"""
