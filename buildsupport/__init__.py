"""What building the package needs beyond setuptools: the build's code revision (not a
package of crawlfleet; only the build backend imports it)."""
