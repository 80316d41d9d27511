"""The soak's time limits and sizes: how fast a key must paint, how long a message may take to be
saved, when a runner must be back. Constants only; imports nothing of the driver.
"""

from __future__ import annotations


#: a key must paint within this (seconds)
FREEZE_S = 1.0
#: a UI that has not painted a key for this long is hung: killed and started again (long: a UI
#: that waits for a runner loading the model again waits that long, on a busy machine 20 s and more)
GIVE_UP_S = 60.0
#: when a slow paint's stacks are asked for
DUMP_AFTER_S = 1.5
POLL_S = 0.02
#: a message the app took must be in the history within this
LOST_GRACE_S = 30.0
ORPHAN_GRACE_S = 10.0
EXTRA_RUNNER_GRACE_S = 10.0
#: a fresh runner after a runner's death, within this
RUNNER_BACK_S = 45.0
#: the data folder's tmpfs
DATA_MB = 48
