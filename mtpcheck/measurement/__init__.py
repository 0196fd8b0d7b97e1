"""What `mtpcheck bench` runs: speculation on vs off on one loaded backend
(bench) and the gates its figures are held to (bench_gates.toml, shipped as
package data). The programs that regenerate docs pages (power, calibration,
side by side, ...) are research, outside the package: research/ in the
checkout."""
