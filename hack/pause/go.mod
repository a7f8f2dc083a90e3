module stageset.local/tools/pause

go 1.24
