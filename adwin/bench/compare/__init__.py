"""``adwin bench compare`` and the comparisons beside it: the window methods side by side (``command``: what
runs; ``setup``, ``methods``, ``plan``, ``sizing``: what it will run; ``stats``, ``tasks``, ``report``, ``suite``:
what it found), the learning curve (``curve``, ``adwin bench curve``) and the sync trainer against AsyncOPD
(``asyncopd``, ``adwin bench async``)."""
