module strata.test/truth

go 1.16
