"""What a trial trains: the workload's data and the pieces it is made of."""
