"""Paper grids: many ``repro train`` runs described in one file (:mod:`.grid`), turned into torchrun,
SLURM/submitit or local jobs (:mod:`.jobs`) and checked before any job starts (:mod:`.check`)."""
