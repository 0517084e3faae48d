// Must not compile: an optimizer with state but no update.
#include <telar/optim/optimizer.hpp>

struct Broken {
  using value_type = float;
  static constexpr int state_size = 0;
};

static_assert(telar::detail::check_optimizer<Broken>());
int main() {}
