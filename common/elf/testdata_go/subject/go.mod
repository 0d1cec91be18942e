module strata.test/subject

go 1.16
