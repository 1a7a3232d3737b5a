"""The job-spec language: the model, the type x mode table, literals, URIs, the pipeline graph."""
