"""From one rank to W: link profiles (configs/links) and the step model that prices and places each collective;
the step on a faster or slower host (host.py)."""
