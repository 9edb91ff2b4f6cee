"""The static HTML run viewer and its call timelines."""
