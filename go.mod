module github.com/idemkv/idemkv

go 1.26
