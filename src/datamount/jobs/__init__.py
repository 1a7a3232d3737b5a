"""Whole Azure ML jobs on one node: command jobs, pipeline jobs, the job's environment."""
