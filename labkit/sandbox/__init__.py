"""Floor 0, the sandbox: untrusted programs run against their tests, graded outside them.

The security boundary of the house, on its lowest floor: it imports nothing of labkit above
it and no torch. :mod:`.pool` runs the warm worker pool and grades in the parent,
:mod:`.worker` is the standard-library-only worker (run as a script), :mod:`.records` the
plain records that go in and come out. ``docs/sandbox.md`` holds the threat model.
"""
