"""Logic of the pipeline stages; rules call these modules as `python -m workflow_scripts.<stage>`."""
