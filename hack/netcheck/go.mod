module stageset.local/tools/netcheck

go 1.24
