// Student's t distribution for server/compare: two-sided tail probabilities and their inverse,
// from the regularized incomplete beta function (Lentz's continued fraction). Degrees of
// freedom may be fractional (Welch-Satterthwaite); past 10^4 the normal is used.
#ifndef STRATA_SERVER_COMPARE_STUDENT_T_H_
#define STRATA_SERVER_COMPARE_STUDENT_T_H_

namespace strata::server::compare {

// P(|T| >= |t|) for T ~ t(df), df > 0.
double TwoSidedP(double t, double df);

// The t >= 0 with TwoSidedP(t, df) == tail, for 0 < tail < 1: t_{1-tail/2}. The one-sided
// quantile t_q (q > 0.5) is TwoSidedQuantile(2 * (1 - q), df).
double TwoSidedQuantile(double tail, double df);

}  // namespace strata::server::compare

#endif  // STRATA_SERVER_COMPARE_STUDENT_T_H_
