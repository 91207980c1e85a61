"""The public dataset classes, one file each."""
