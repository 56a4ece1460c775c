"""Data files shipped with dtype-doctor (generated; see each file's generator in scripts/)."""
