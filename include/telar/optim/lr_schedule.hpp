#pragma once
/*! \file
 *  \brief Learning-rate schedules: host functions of the 1-based step. */
#include <algorithm>
#include <cmath>
#include <functional>

namespace telar {

/*! \brief A learning-rate schedule: step (1-based) -> learning rate. */
using LRSchedule = std::function<double(long long)>;

/*! \brief The same rate at every step. \param lr the rate */
inline LRSchedule constant_lr(double lr) {
  return [lr](long long) { return lr; };
}

/*! \brief Linear warm-up from lr/warmup to lr over \p warmup steps, then
 *  cosine decay to \p min_lr at \p total steps (held there afterwards).
 *  \param lr peak rate \param warmup warm-up steps \param total total steps
 *  \param min_lr final rate */
inline LRSchedule warmup_cosine(double lr, long long warmup, long long total, double min_lr = 0) {
  return [=](long long step) {
    if (warmup > 0 && step <= warmup)
      return lr * double(step) / double(warmup);
    long long const span = std::max<long long>(1, total - warmup);
    double const t = std::min(1.0, double(step - warmup) / double(span));
    return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(3.14159265358979323846 * t));
  };
}

/*! \brief Linear warm-up over \p warmup steps, then multiply by \p gamma every
 *  \p step_size steps. \param lr base rate \param step_size steps per decay
 *  \param gamma decay factor \param warmup warm-up steps */
inline LRSchedule warmup_step(double lr, long long step_size, double gamma, long long warmup = 0) {
  return [=](long long step) {
    if (warmup > 0 && step <= warmup)
      return lr * double(step) / double(warmup);
    long long const k = step_size > 0 ? (step - 1 - warmup) / step_size : 0;
    return lr * std::pow(gamma, double(std::max<long long>(0, k)));
  };
}

} // namespace telar
