// Small formatting helpers shared by the views.

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function number(n, digits = 1) {
  if (n === undefined || n === null || Number.isNaN(n)) return "–";
  return Number(n).toFixed(digits);
}

export function micros(us) {
  if (us === undefined || us === null || Number.isNaN(us)) return "–";
  return us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(0)} µs`;
}

export function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString();
}
