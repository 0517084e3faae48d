// Must not compile: int is not a strategy policy.
#include <telar/parallel/strategy.hpp>

int main() {
  telar::Strategy<telar::DataParallel<>, int> s;
}
