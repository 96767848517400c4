"""One node's launcher, from `shoal train` (or `shoal.fit`) to its workers, in the order it runs.

`supervisor` runs the job on this node: it meets the other machines (`rendezvous`), runs numbered
attempts, and after a failure follows the leader's decision. Each attempt starts this node's workers
through torch's agent (`launch`; `agent`, the only module touching the agent's private members),
forked from a fork server (`forkserver`) through light stand-ins
(`standin`) where the caller started one, while `watch` stops them once the attempt failed
elsewhere. Nothing here imports training: what the supervisor needs from it is handed in.
"""
