"""``trtserve serve``: the process tree (a supervisor, one engine core, N front ends) or, with one
front end, one process."""
