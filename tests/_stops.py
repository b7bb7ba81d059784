"""Stop requests for tests, importable without conftest's set-up (the fresh processes of `_sharded_check.py`)."""


class StopAfter:
    """A stop request that fires on its (reads + 1)-th reading, as a signal arriving mid-run would."""

    def __init__(self, reads: int):
        self.reads = reads

    @property
    def reason(self):
        self.reads -= 1
        return "test stop" if self.reads < 0 else None
