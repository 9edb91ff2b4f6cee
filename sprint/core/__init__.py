"""The bottom layer: errors and exit codes, options, dataset input, run folders, the item loop."""
