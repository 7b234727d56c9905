"""The transport layer's Python face: the emulated network
(:mod:`.network`: slow, uneven and lossy links behind the same narrow
interface as MPI) and timelines (:mod:`.timeline`: what every op and
message did, for a trace viewer)."""
