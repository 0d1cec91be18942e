#include "server/compare/student_t.h"

#include <cmath>

namespace strata::server::compare {
namespace {

constexpr double kNormalDf = 1e4;

// Continued fraction of the incomplete beta function (modified Lentz).
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEpsilon = 1e-15;
  double c = 1;
  double d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10'000; ++m) {
    const double m2 = 2.0 * m;
    // Even step.
    double num = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + num * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + num / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    // Odd step.
    num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + num * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + num / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < kEpsilon) break;
  }
  return h;
}

// I_x(a, b), the regularized incomplete beta function.
double RegularizedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double log_front =
      std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  const double front = std::exp(log_front);
  // The fraction converges fast on this side of the mean; the other side by symmetry.
  if (x < (a + 1) / (a + b + 2)) return front * BetaContinuedFraction(a, b, x) / a;
  return 1 - front * BetaContinuedFraction(b, a, 1 - x) / b;
}

}  // namespace

double TwoSidedP(double t, double df) {
  if (std::isnan(t) || !(df > 0)) return std::nan("");
  if (std::isinf(t)) return 0;
  if (df > kNormalDf) return std::erfc(std::fabs(t) / std::sqrt(2.0));
  return RegularizedBeta(df / 2, 0.5, df / (df + t * t));
}

double TwoSidedQuantile(double tail, double df) {
  if (!(tail > 0 && tail < 1) || !(df > 0)) return std::nan("");
  // TwoSidedP falls monotonically in t, with slope -2 * density(t): Newton's steps inside a
  // bracket (doubled from [0, 1]), bisecting whenever a step would leave it. A few steps where
  // bisection took ~45: a comparison asks for three quantiles per key.
  const bool normal = df > kNormalDf;
  const double log_scale = normal ? -0.5 * std::log(2 * M_PI)
                                  : std::lgamma((df + 1) / 2) - std::lgamma(df / 2) -
                                        0.5 * std::log(df * M_PI);
  auto density = [&](double t) {
    return std::exp(normal ? log_scale - t * t / 2
                           : log_scale - (df + 1) / 2 * std::log1p(t * t / df));
  };
  double low = 0, high = 1;
  while (TwoSidedP(high, df) > tail && high < 1e12) {
    low = high;
    high *= 2;
  }
  double t = (low + high) / 2;
  for (int i = 0; i < 200; ++i) {
    const double excess = TwoSidedP(t, df) - tail;
    if (excess == 0) return t;
    (excess > 0 ? low : high) = t;
    double next = t + excess / (2 * density(t));
    if (!(next > low && next < high)) next = (low + high) / 2;
    const bool done = std::fabs(next - t) <= 1e-12 * next || high - low <= 1e-12 * high;
    t = next;
    if (done) break;
  }
  return t;
}

}  // namespace strata::server::compare
