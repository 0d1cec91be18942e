module strata.test/goworkload

go 1.16
