#pragma once
// gemm_batched's device path for KokkosKernelsGemm: one launch, one team per
// batch entry running KokkosBatched::TeamGemm. telar/core/gemm.hpp includes
// it only in builds with a device; tests include it directly to check it on
// the host.
#include <KokkosBatched_Gemm_Decl.hpp>
#include <KokkosBatched_Gemm_Team_Impl.hpp>
#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar::detail {

// C(b1, b2) = alpha op(A(b1, b2)) op(B(b1, b2)) + beta C(b1, b2), one team per
// entry (TA, TB: KokkosBatched::Trans tags).
template <class TA, class TB, class Exec, class AV, class BV, class CV, class T>
void team_gemm_batched(Exec const& exec, T alpha, AV A, BV B, T beta, CV C) {
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  using Gemm = KokkosBatched::TeamGemm<Member, TA, TB, KokkosBatched::Algo::Gemm::Unblocked>;
  std::size_t const n2 = C.extent(1);
  Kokkos::parallel_for(
      "telar::gemm_batched::kokkos-kernels", Policy(exec, int(C.extent(0) * n2), Kokkos::AUTO),
      KOKKOS_LAMBDA(Member const& m) {
        std::size_t const b = std::size_t(m.league_rank()), b1 = b / n2, b2 = b % n2;
        Gemm::invoke(m, alpha, Kokkos::subview(A, b1, b2, Kokkos::ALL, Kokkos::ALL),
                     Kokkos::subview(B, b1, b2, Kokkos::ALL, Kokkos::ALL), beta,
                     Kokkos::subview(C, b1, b2, Kokkos::ALL, Kokkos::ALL));
      });
}

template <class Exec, class AV, class BV, class CV, class T>
void kokkos_kernels_gemm_batched(Exec const& exec, char ta, char tb, T alpha, AV A, BV B, T beta,
                                 CV C) {
  using N = KokkosBatched::Trans::NoTranspose;
  using Tr = KokkosBatched::Trans::Transpose;
  if (ta == 'N' && tb == 'N')
    team_gemm_batched<N, N>(exec, alpha, A, B, beta, C);
  else if (ta == 'N')
    team_gemm_batched<N, Tr>(exec, alpha, A, B, beta, C);
  else if (tb == 'N')
    team_gemm_batched<Tr, N>(exec, alpha, A, B, beta, C);
  else
    team_gemm_batched<Tr, Tr>(exec, alpha, A, B, beta, C);
}

} // namespace telar::detail
