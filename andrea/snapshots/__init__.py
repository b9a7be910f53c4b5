"""The embedding tables while they learn: snapshots written and read (store), a run's observers that
take them (observers), and what they show over a run (timeline)."""
