"""A training job, composed: the layer above training (the ranks' loop), measure (the VRAM sampler, provenance)
and plan (the memory guard). `launch.py` runs one run spec; `lever_trial.py` runs a configuration's candidate
lever sets through it and keeps the fastest. Nothing below imports from here."""
