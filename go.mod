module forkd

go 1.19
