#include <telar/optim/lr_schedule.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

using Catch::Approx;

TEST_CASE("Learning-rate schedules", "[optim][lr]") {
  auto c = telar::constant_lr(0.3);
  CHECK(c(1) == 0.3);
  CHECK(c(1000) == 0.3);

  auto wc = telar::warmup_cosine(1.0, 10, 110, 0.1);
  CHECK(wc(1) == Approx(0.1));
  CHECK(wc(5) == Approx(0.5));
  CHECK(wc(10) == Approx(1.0));
  CHECK(wc(60) == Approx(0.1 + 0.45 * (1 + std::cos(3.14159265358979 * 0.5))));
  CHECK(wc(110) == Approx(0.1));
  CHECK(wc(500) == Approx(0.1));

  auto ws = telar::warmup_step(1.0, 10, 0.5, 2);
  CHECK(ws(1) == Approx(0.5));
  CHECK(ws(2) == Approx(1.0));
  CHECK(ws(12) == Approx(1.0));
  CHECK(ws(13) == Approx(0.5));
  CHECK(ws(23) == Approx(0.25));
}
