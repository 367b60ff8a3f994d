"""Running a target's cells: the plan, the run directory, launchers, schedulers, and cleaning up."""
